"""Nothing lost where the consumer used to lose or stop silently, each through `fibers consume` against the
real Kafka, MongoDB, API server and schema registry:

- "latest" is resolved once: records written while the consumer is down are consumed after it restarts;
- a Kafka sink whose records the broker refuses never moves the checkpoint past them;
- a bootstrap stops between pages when asked to, and gives its Leases up;
- a history sink keeps every snapshot row of a bootstrap, with its row;
- a record that cannot be decoded goes as spec.onUndecodable says (fail names it, skip and deadLetter go on);
- a schema registry that does not answer for a while is waited out, not taken for bad records;
- a topic deleted and created again under its name stops the consumer instead of resuming at the old offset.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client
from kubernetes.client import ApiClient
from pymongo import MongoClient

from fibers.consumer.ownership import lease_name
from fibers.consumer.undecodable import HEADER_PREFIX
from fibers.databus.timelines import STATS_ANNOTATION
from fibers.wire import HEADER, Registry
from fibers_stack import StackInfo
from tests.helpers import produce, wait_for
from tests.integration.test_databus import consumer_config, run_consumer, stored_checkpoint
from tests.integration.test_databus_driver import Bootstrap

pytestmark = pytest.mark.databus

SLOW_PAGES = '''
import pathlib, time
from fibers.consumer.callbacks import Callback, Result

class SlowPages(Callback):
    """Takes 2 s over each bootstrap page and notes each page it finished."""

    def __init__(self, journal):
        self.journal = pathlib.Path(journal)

    def on_end_bootstrap_sequence(self, scn):
        time.sleep(2)
        with self.journal.open("a") as f:
            f.write("page\\n")
        return Result.SUCCESS
'''


@pytest.fixture
def topic(stack_info: StackInfo, unique: str) -> str:
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})  # held: its futures die with it
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    return unique


def view(stack_info: StackInfo, database: str) -> dict[str, Any]:
    return {"type": "mongodb", "uriEnv": "FIBERS_SINK_MONGODB_URI", "database": database, "collection": "view"}


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


def test_latest_is_resolved_once_so_what_is_written_while_the_consumer_is_down_is_consumed(
    stack_info: StackInfo, kube: ApiClient, namespace: str, topic: str, tmp_path: Path, mongo: MongoClient[Any]
) -> None:
    """The old runtime resolved "latest" again at every start until a window was applied: the records
    written between a first start with nothing to read and the next start were skipped for good."""
    config = consumer_config(
        f"{topic}-c", namespace, topic, stack_info, view(stack_info, topic), startPosition="latest"
    )
    log = tmp_path / "consumer.log"
    first = run_consumer(stack_info, config, log)
    wait_for(lambda: "consuming" in log.read_text(), timeout=60, what="the consumer took its partition")
    time.sleep(1)
    assert stop(first) == 0
    produce(stack_info.kafka_bootstrap, topic, [{"id": i, "item": f"while-down-{i}"} for i in range(5)], key="id")
    second = run_consumer(stack_info, config, log)
    try:
        wait_for(
            lambda: mongo[topic]["view"].count_documents({}) == 5 or None,
            timeout=60,
            what="the records written while the consumer was down",
        )
    finally:
        assert stop(second) == 0


def create_again(bootstrap: str, topic: str) -> None:
    """Delete the topic and create it again under its name (Kafka deletes asynchronously: tried until it takes)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)

    def created() -> bool | None:
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        except KafkaException:  # still being deleted
            return None
        return True

    wait_for(created, timeout=60, what=f"topic {topic} created again")


def test_a_topic_created_again_stops_the_consumer_instead_of_resuming_at_the_old_topics_offset(
    stack_info: StackInfo, namespace: str, topic: str, tmp_path: Path, mongo: MongoClient[Any]
) -> None:
    """The old runtime resumed the new topic at the old one's offset: the new topic's first records were
    skipped, and nothing said so. Now the checkpoint records the topic's id, and another id stops it."""
    config = consumer_config(f"{topic}-c", namespace, topic, stack_info, view(stack_info, topic))
    produce(stack_info.kafka_bootstrap, topic, [{"id": i, "item": f"old-{i}"} for i in range(3)], key="id")
    first = run_consumer(stack_info, config, tmp_path / "c.log")
    try:
        wait_for(lambda: mongo[topic]["view"].count_documents({}) == 3 or None, timeout=60, what="the old records")
        time.sleep(0.5)  # past the checkpoint interval: the stop writes the last one anyway
    finally:
        assert stop(first) == 0
    create_again(stack_info.kafka_bootstrap, topic)
    produce(stack_info.kafka_bootstrap, topic, [{"id": 100 + i, "item": f"new-{i}"} for i in range(5)], key="id")
    termination = tmp_path / "termination"
    second = run_consumer(stack_info, config, tmp_path / "c.log", {"FIBERS_TERMINATION_LOG": str(termination)})
    try:
        assert second.wait(60) == 5
    finally:
        if second.poll() is None:
            second.kill()
    message = termination.read_text()
    assert message.startswith("RelayChanged:") and f"{topic}.0" in message and "topic" in message, message
    assert sorted(d["id"] for d in mongo[topic]["view"].find()) == [0, 1, 2]  # none of the new topic


def test_a_kafka_sink_the_broker_refuses_never_moves_the_checkpoint_past_its_records(
    stack_info: StackInfo, kube: ApiClient, namespace: str, topic: str, tmp_path: Path
) -> None:
    """The broker refuses each record (larger than the output topic's max.message.bytes) after the producer
    queued it; the old sink took the emptied queue for delivery and checkpointed past every record."""
    out = f"{topic}-out"
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})
    admin.create_topics([NewTopic(out, 1, 1, config={"max.message.bytes": "300"})])[out].result(30)
    produce(stack_info.kafka_bootstrap, topic, [{"id": i, "blob": "x" * 1000} for i in range(3)], key="id")
    name = f"{topic}-c"
    config = consumer_config(
        name,
        namespace,
        topic,
        stack_info,
        {"type": "kafka", "topic": out},
        callback={"retries": 1, "retryBackoffSeconds": 0.1},
    )
    termination = tmp_path / "termination"
    proc = run_consumer(stack_info, config, tmp_path / "c.log", {"FIBERS_TERMINATION_LOG": str(termination)})
    assert proc.wait(90) == 1
    assert "not delivered" in termination.read_text()
    cp = stored_checkpoint(kube, namespace, name, f"{topic}/0")
    assert cp is None or cp.get("kafka_next_offset") in (None, 0), cp


def test_a_bootstrap_stops_between_pages_when_asked_and_gives_its_leases_up(
    stack_info: StackInfo, kube: ApiClient, namespace: str, unique: str, tmp_path: Path
) -> None:
    """SIGTERM used to be noticed only once the whole bootstrap was done (the kubelet's SIGKILL came first, the
    Leases still held, so the next pod waited for them to expire)."""
    setup = Bootstrap(stack_info, namespace, unique, tmp_path)
    try:
        setup.produce([{"id": i, "item": f"row{i}"} for i in range(3000)])  # 6 pages, 2 s each
        wait_for(lambda: setup.store_offset() >= 2999 or None, timeout=120, what="the store took every row")
        (tmp_path / "slow.py").write_text(SLOW_PAGES)
        journal = tmp_path / "journal"
        config = consumer_config(
            f"{unique}-view",
            namespace,
            unique,
            stack_info,
            {"type": "callback", "callback": "slow:SlowPages", "options": {"journal": str(journal)}},
            bootstrap={"uriEnv": "FIBERS_BOOTSTRAP_MONGODB_URI", "database": setup.database},
            startPosition="bootstrap",
        )
        proc = run_consumer(stack_info, config, tmp_path / "view.log", {"PYTHONPATH": str(tmp_path)})
        wait_for(lambda: journal.exists() or None, timeout=60, what="the first page")
        asked = time.monotonic()
        assert stop(proc) == 0
        assert time.monotonic() - asked < 6  # the page under way, not the 5 left
        assert journal.read_text().count("page") < 4
        lease = client.CoordinationV1Api(kube).read_namespaced_lease(lease_name(f"{unique}-view", unique, 0), namespace)
        assert not lease.spec.holder_identity  # given up: the next owner need not wait for it to expire
    finally:
        setup.stop()


def test_a_history_sink_keeps_every_snapshot_row_whole(
    stack_info: StackInfo, namespace: str, unique: str, tmp_path: Path, mongo: MongoClient[Any]
) -> None:
    """Snapshot rows all had offset -1, so a history kept one of them per partition, without its row."""
    setup = Bootstrap(stack_info, namespace, unique, tmp_path)
    try:
        setup.produce([{"id": i, "item": f"row{i}"} for i in range(20)])
        wait_for(lambda: setup.store_offset() >= 19 or None, timeout=60, what="the store took every row")
        history = {"type": "history", "uriEnv": "FIBERS_SINK_MONGODB_URI", "database": unique, "collection": "h"}
        config = consumer_config(
            f"{unique}-history",
            namespace,
            unique,
            stack_info,
            history,
            bootstrap={"uriEnv": "FIBERS_BOOTSTRAP_MONGODB_URI", "database": setup.database},
            startPosition="bootstrap",
        )
        proc = run_consumer(stack_info, config, tmp_path / "history.log")
        try:
            docs = wait_for(
                lambda: ((d := list(mongo[unique]["h"].find())) and len(d) >= 20 and d) or None,
                timeout=60,
                what="a document per snapshot row",
            )
        finally:
            assert stop(proc) == 0
        assert sorted(d["after"]["item"] for d in docs) == sorted(f"row{i}" for i in range(20))
        assert {d["op"] for d in docs} == {"r"}
    finally:
        setup.stop()


def passed_over(kube: ApiClient, namespace: str, config_map: str) -> dict[str, int] | None:
    """The undecodable records instance 0 recorded with its checkpoints, once it recorded any."""
    cm = client.CoreV1Api(kube).read_namespaced_config_map(config_map, namespace)
    figures = json.loads((cm.metadata.annotations or {}).get(f"{STATS_ANNOTATION}0", "{}"))
    counts: dict[str, int] = figures.get("undecodable") or {}
    return counts if any(counts.values()) else None


def undecodable_topic(stack_info: StackInfo, topic: str) -> None:
    producer = Producer({"bootstrap.servers": stack_info.kafka_bootstrap})
    for key, value in ((b"1", b'{"id": 1}'), (b"2", b"\x01not json at all"), (b"3", b'{"id": 3}')):
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("action", ["fail", "skip", "deadLetter"])
def test_an_undecodable_record_goes_as_the_policy_says(
    action: str,
    stack_info: StackInfo,
    kube: ApiClient,
    namespace: str,
    topic: str,
    tmp_path: Path,
    mongo: MongoClient[Any],
) -> None:
    """It used to end the process with a traceback (a crash loop in a pod); the only way past was a seek."""
    undecodable_topic(stack_info, topic)
    name, dead = f"{topic}-c", f"{topic}-dlq"
    policy = {"action": action, **({"deadLetterTopic": dead} if action == "deadLetter" else {})}
    config = consumer_config(name, namespace, topic, stack_info, view(stack_info, topic), onUndecodable=policy)
    termination = tmp_path / "termination"
    proc = run_consumer(stack_info, config, tmp_path / "c.log", {"FIBERS_TERMINATION_LOG": str(termination)})
    if action == "fail":
        assert proc.wait(60) == 6
        message = termination.read_text()
        assert message.startswith("UndecodableRecord:") and f"{topic}/0 offset 1" in message, message
        assert [d["id"] for d in mongo[topic]["view"].find()] == [1]  # the record before it, nothing after
        return
    try:
        wait_for(lambda: mongo[topic]["view"].count_documents({}) == 2 or None, timeout=60, what="both good records")
        stats = wait_for(
            lambda: passed_over(kube, namespace, f"{name}-checkpoint"), timeout=30, what="the count in the figures"
        )
    finally:
        assert stop(proc) == 0
    assert stats == ({"skipped": 1, "deadLettered": 0} if action == "skip" else {"skipped": 0, "deadLettered": 1})
    if action == "deadLetter":
        reader = Consumer({"bootstrap.servers": stack_info.kafka_bootstrap, "group.id": "probe"})
        reader.assign([TopicPartition(dead, 0, 0)])
        try:
            message = wait_for(lambda: ((m := reader.poll(1)) and not m.error() and m) or None, timeout=30, what="dlq")
        finally:
            reader.close()
        assert message.value() == b"\x01not json at all"
        headers = dict(message.headers() or [])
        assert headers[f"{HEADER_PREFIX}topic"] == topic.encode()
        assert headers[f"{HEADER_PREFIX}offset"] == b"1"
        assert b"not JSON" in headers[f"{HEADER_PREFIX}error"]


def test_a_schema_registry_that_does_not_answer_for_a_while_is_waited_out(
    stack_info: StackInfo, namespace: str, topic: str, tmp_path: Path, mongo: MongoClient[Any]
) -> None:
    """A registry outage used to read as MalformedEvent: the consumer stopped on good records. Here the
    registry look-ups fail three times (the failpoint raises what a refused connection raises)."""
    url = stack_info.registry_url + "/apis/ccompat/v7"
    schema = {
        "type": "record",
        "name": "Row",
        "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
    }
    registry = Registry(url)
    schema_id = registry.register(f"{topic}-value", json.dumps(schema))
    registry.close()
    producer = Producer({"bootstrap.servers": stack_info.kafka_bootstrap})
    parsed = fastavro.parse_schema(schema)
    for i in range(4):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, {"id": i, "item": f"avro{i}"})
        producer.produce(topic, key=str(i).encode(), value=HEADER.pack(0, schema_id) + body.getvalue())
    assert producer.flush(30) == 0
    config = consumer_config(f"{topic}-c", namespace, topic, stack_info, view(stack_info, topic))
    config["relay"]["avro"] = {"registryUrl": url}
    log = tmp_path / "c.log"
    proc = run_consumer(stack_info, config, log, {"FIBERS_FAILPOINTS": "registry.lookup=3*error"})
    try:
        wait_for(lambda: mongo[topic]["view"].count_documents({}) == 4 or None, timeout=60, what="every record")
    finally:
        assert stop(proc) == 0
    assert "schema registry unavailable" in log.read_text()


def test_an_instance_never_reads_or_writes_a_checkpoint_configmap_of_another_consumer(
    stack_info: StackInfo, kube: ApiClient, namespace: str, topic: str, unique: str, tmp_path: Path
) -> None:
    """The operator refuses to start a consumer whose checkpoint ConfigMap is not its own; an instance
    that meets one anyway (labelled for another consumer since) stops on it instead of resuming from the
    other consumer's offsets and writing over them."""
    core = client.CoreV1Api(kube)
    theirs = {"fibers.dev/databusconsumer": "another-consumer"}
    data = {"note": "another consumer's"}
    meta = client.V1ObjectMeta(name=f"{unique}-checkpoint", labels=theirs)
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=meta, data=data))
    config = consumer_config(unique, namespace, topic, stack_info, {"type": "log"})
    config["labels"] = {"fibers.dev/databusconsumer": unique}
    proc = run_consumer(stack_info, config, tmp_path / "consumer.log")
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise AssertionError("the instance ran on another consumer's checkpoint ConfigMap") from None
    assert code != 0
    assert "belongs to consumer another-consumer" in (tmp_path / "consumer.log").read_text()
    kept = core.read_namespaced_config_map(f"{unique}-checkpoint", namespace)
    assert kept.data == data and not (kept.metadata.annotations or {})
